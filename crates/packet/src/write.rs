//! Writing traces: legacy pcap (µs or ns) and pcapng (interfaces and link types kept), optionally compressed.
//!
//! Writers are streaming and buffered: `new(w)`, `write_*` per packet, `finish()` to flush and get `w` back.

use std::io::{self, BufWriter, Write};

use crate::error::WriteError;
use crate::read::{Compression, Interface, Record, TsResolution};
use crate::types::{LinkType, TsPrecision};

const BUF: usize = 1 << 17;

/// Writer of legacy pcap files (little-endian, version 2.4).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: BufWriter<W>,
    linktype: LinkType,
    precision: TsPrecision,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header and returns the writer.
    pub fn new(w: W, linktype: LinkType, snaplen: u32, precision: TsPrecision) -> Result<PcapWriter<W>, WriteError> {
        let mut w = BufWriter::with_capacity(BUF, w);
        let magic: u32 = match precision {
            TsPrecision::Micro => 0xa1b2_c3d4,
            TsPrecision::Nano => 0xa1b2_3c4d,
        };
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&magic.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&linktype.0.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w, linktype, precision })
    }

    /// The file's link type.
    pub fn linktype(&self) -> LinkType {
        self.linktype
    }

    /// Appends one packet. Timestamps are truncated to the file's precision, as libpcap does.
    pub fn write_packet(&mut self, ts_ns: u64, wirelen: u32, data: &[u8]) -> Result<(), WriteError> {
        self.w.write_all(&pcap_record_header(self.precision, ts_ns, wirelen, data.len())?)?;
        self.w.write_all(data)?;
        Ok(())
    }

    /// Appends a record read from another trace; its link type must be the file's (FCS bits aside).
    pub fn write_record(&mut self, rec: &Record<'_>) -> Result<(), WriteError> {
        if rec.linktype.base() != self.linktype.base() {
            return Err(WriteError::LinkTypeMismatch { file: self.linktype, packet: rec.linktype });
        }
        self.write_packet(rec.ts_ns, rec.wirelen, rec.data)
    }

    /// Flushes and returns the inner writer.
    pub fn finish(self) -> Result<W, WriteError> {
        self.w.into_inner().map_err(|e| WriteError::Io(e.into_error()))
    }
}

/// The 16-byte header [`PcapWriter`] writes before a packet of `caplen` bytes (little-endian; the timestamp
/// truncated to `precision`), for writers that place records themselves (at precomputed offsets, in parallel).
pub fn pcap_record_header(
    precision: TsPrecision,
    ts_ns: u64,
    wirelen: u32,
    caplen: usize,
) -> Result<[u8; 16], WriteError> {
    let caplen32 = u32::try_from(caplen).map_err(|_| WriteError::PacketTooLarge { len: caplen })?;
    let sec = u32::try_from(ts_ns / 1_000_000_000).map_err(|_| WriteError::TimestampOutOfRange { ts_ns })?;
    let sub = ts_ns % 1_000_000_000;
    let frac = match precision {
        TsPrecision::Micro => sub / 1000,
        TsPrecision::Nano => sub,
    } as u32;
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&sec.to_le_bytes());
    h[4..8].copy_from_slice(&frac.to_le_bytes());
    h[8..12].copy_from_slice(&caplen32.to_le_bytes());
    h[12..16].copy_from_slice(&wirelen.to_le_bytes());
    Ok(h)
}

/// Writer of pcapng files (one little-endian section).
#[derive(Debug)]
pub struct PcapNgWriter<W: Write> {
    w: BufWriter<W>,
    ifaces: Vec<TsPrecision>,
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

impl<W: Write> PcapNgWriter<W> {
    /// Writes the section header block and returns the writer.
    pub fn new(w: W) -> Result<PcapNgWriter<W>, WriteError> {
        let mut w = BufWriter::with_capacity(BUF, w);
        let mut b = Vec::with_capacity(28);
        b.extend_from_slice(&0x0a0d_0d0au32.to_le_bytes());
        b.extend_from_slice(&28u32.to_le_bytes());
        b.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(-1i64).to_le_bytes());
        b.extend_from_slice(&28u32.to_le_bytes());
        w.write_all(&b)?;
        Ok(PcapNgWriter { w, ifaces: Vec::new() })
    }

    /// Declares an interface and returns its id (ids count up from 0 in the order of declaration).
    ///
    /// pcapng holds the 16-bit link type proper; FCS bits of a pcap link-type field become `if_fcslen`, other
    /// upper bits (reserved, zero in valid files) are dropped.
    pub fn add_interface(
        &mut self,
        linktype: LinkType,
        snaplen: u32,
        precision: TsPrecision,
        name: Option<&str>,
    ) -> Result<u32, WriteError> {
        self.add_interface_with_fcs(linktype, snaplen, precision, name, None)
    }

    /// [`add_interface`](Self::add_interface) with an explicit FCS length in bytes (`if_fcslen`).
    pub fn add_interface_with_fcs(
        &mut self,
        linktype: LinkType,
        snaplen: u32,
        precision: TsPrecision,
        name: Option<&str>,
        fcs_len: Option<u8>,
    ) -> Result<u32, WriteError> {
        let lt = linktype.base().0 as u16;
        let fcs_len = fcs_len.or_else(|| (linktype.0 & 0x0400_0000 != 0).then_some(((linktype.0 >> 28) * 2) as u8));
        let mut opts = Vec::new();
        if let Some(f) = fcs_len {
            opts.extend_from_slice(&13u16.to_le_bytes());
            opts.extend_from_slice(&1u16.to_le_bytes());
            opts.extend_from_slice(&[f, 0, 0, 0]);
        }
        if let Some(name) = name {
            let n = name.as_bytes();
            let n = &n[..n.len().min(u16::MAX as usize - 4)];
            opts.extend_from_slice(&2u16.to_le_bytes());
            opts.extend_from_slice(&(n.len() as u16).to_le_bytes());
            opts.extend_from_slice(n);
            opts.resize(pad4(opts.len()), 0);
        }
        if precision == TsPrecision::Nano {
            opts.extend_from_slice(&9u16.to_le_bytes());
            opts.extend_from_slice(&1u16.to_le_bytes());
            opts.extend_from_slice(&[9, 0, 0, 0]);
        }
        if !opts.is_empty() {
            opts.extend_from_slice(&[0, 0, 0, 0]);
        }
        let len = (20 + opts.len()) as u32;
        let mut b = Vec::with_capacity(len as usize);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&lt.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&snaplen.to_le_bytes());
        b.extend_from_slice(&opts);
        b.extend_from_slice(&len.to_le_bytes());
        self.w.write_all(&b)?;
        self.ifaces.push(precision);
        Ok(self.ifaces.len() as u32 - 1)
    }

    /// Interfaces declared so far.
    pub fn interface_count(&self) -> u32 {
        self.ifaces.len() as u32
    }

    /// Appends an enhanced packet block on interface `iface` (which must have been declared).
    pub fn write_packet(&mut self, iface: u32, ts_ns: u64, wirelen: u32, data: &[u8]) -> Result<(), WriteError> {
        let precision = *self.ifaces.get(iface as usize).ok_or_else(|| {
            WriteError::Io(io::Error::new(io::ErrorKind::InvalidInput, "packet on an undeclared pcapng interface"))
        })?;
        let caplen = u32::try_from(data.len()).map_err(|_| WriteError::PacketTooLarge { len: data.len() })?;
        let ts = match precision {
            TsPrecision::Micro => ts_ns / 1000,
            TsPrecision::Nano => ts_ns,
        };
        let padded = pad4(data.len());
        let len = u32::try_from(32 + padded).map_err(|_| WriteError::PacketTooLarge { len: data.len() })?;
        let mut h = [0u8; 28];
        h[0..4].copy_from_slice(&6u32.to_le_bytes());
        h[4..8].copy_from_slice(&len.to_le_bytes());
        h[8..12].copy_from_slice(&iface.to_le_bytes());
        h[12..16].copy_from_slice(&((ts >> 32) as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(ts as u32).to_le_bytes());
        h[20..24].copy_from_slice(&caplen.to_le_bytes());
        h[24..28].copy_from_slice(&wirelen.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(data)?;
        self.w.write_all(&[0u8; 3][..padded - data.len()])?;
        self.w.write_all(&len.to_le_bytes())?;
        Ok(())
    }

    /// Flushes and returns the inner writer.
    pub fn finish(self) -> Result<W, WriteError> {
        self.w.into_inner().map_err(|e| WriteError::Io(e.into_error()))
    }
}

/// The coarsest precision that keeps every timestamp of an interface with resolution `r` as pcaptool reads it
/// (nanoseconds, truncated).
pub fn precision_for(r: TsResolution) -> TsPrecision {
    match r {
        TsResolution::Decimal(e) if e <= 6 => TsPrecision::Micro,
        TsResolution::Binary(e) if e <= 6 => TsPrecision::Micro,
        _ => TsPrecision::Nano,
    }
}

/// The output container of a [`TraceWriter`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OutputFormat {
    /// Legacy pcap with the given precision.
    Pcap(TsPrecision),
    /// pcapng; `None` keeps each interface's precision, `Some` forces one.
    PcapNg(Option<TsPrecision>),
}

#[derive(Debug)]
enum Inner<W: Write> {
    /// pcap waits for the first record to learn the link type.
    PendingPcap(Option<W>, TsPrecision),
    Pcap(PcapWriter<W>),
    PcapNg(PcapNgWriter<W>, Option<TsPrecision>),
}

/// A writer that copies records of one source trace into pcap or pcapng, keeping link types and, for pcapng,
/// interface ids. The pcap header is written at the first record (or at `finish` from the source's interfaces).
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    inner: Inner<W>,
    snaplen: Option<u32>,
}

impl<W: Write> TraceWriter<W> {
    /// A writer of `format` into `w`.
    pub fn new(w: W, format: OutputFormat) -> Result<TraceWriter<W>, WriteError> {
        let inner = match format {
            OutputFormat::Pcap(p) => Inner::PendingPcap(Some(w), p),
            OutputFormat::PcapNg(p) => Inner::PcapNg(PcapNgWriter::new(w)?, p),
        };
        Ok(TraceWriter { inner, snaplen: None })
    }

    /// Sets the snapshot length written in headers (default: the source interface's).
    pub fn snaplen(&mut self, snaplen: u32) -> &mut TraceWriter<W> {
        self.snaplen = Some(snaplen);
        self
    }

    /// Appends `rec`, whose interface is described by `ifaces[rec.iface]` (the source reader's interfaces).
    pub fn write(&mut self, rec: &Record<'_>, ifaces: &[Interface]) -> Result<(), WriteError> {
        match &mut self.inner {
            Inner::PendingPcap(w, p) => {
                let src = ifaces.get(rec.iface as usize);
                let snap = self.snaplen.or_else(|| src.map(|i| i.snaplen)).unwrap_or(65535);
                let w = w.take().expect("pending writer present");
                let mut lt = rec.linktype;
                if let Some(f) = src.and_then(|i| i.fcs_len)
                    && lt.0 == lt.base().0
                {
                    lt = LinkType(lt.0 | 0x0400_0000 | (u32::from(f / 2) & 0xf) << 28);
                }
                let mut pw = PcapWriter::new(w, lt, snap, *p)?;
                pw.write_record(rec)?;
                self.inner = Inner::Pcap(pw);
                Ok(())
            }
            Inner::Pcap(w) => w.write_record(rec),
            Inner::PcapNg(w, forced) => {
                while w.interface_count() <= rec.iface {
                    let i = w.interface_count() as usize;
                    let (lt, snap, prec, name, fcs) = match ifaces.get(i) {
                        Some(src) => {
                            (src.linktype, src.snaplen, precision_for(src.tsresol), src.name.as_deref(), src.fcs_len)
                        }
                        None => (rec.linktype, 0, TsPrecision::Nano, None, None),
                    };
                    w.add_interface_with_fcs(lt, self.snaplen.unwrap_or(snap), forced.unwrap_or(prec), name, fcs)?;
                }
                w.write_packet(rec.iface, rec.ts_ns, rec.wirelen, rec.data)
            }
        }
    }

    /// Declares every interface of `ifaces` not declared yet (pcapng; pcap has its one interface in its
    /// header), so that they come before the first packet and are there even if no packet refers to them.
    pub fn declare(&mut self, ifaces: &[Interface]) -> Result<(), WriteError> {
        if let Inner::PcapNg(w, forced) = &mut self.inner {
            while (w.interface_count() as usize) < ifaces.len() {
                let src = &ifaces[w.interface_count() as usize];
                let snap = self.snaplen.unwrap_or(src.snaplen);
                let prec = forced.unwrap_or(precision_for(src.tsresol));
                w.add_interface_with_fcs(src.linktype, snap, prec, src.name.as_deref(), src.fcs_len)?;
            }
        }
        Ok(())
    }

    /// Flushes and returns the inner writer; an empty pcap gets its header from `ifaces` (or Ethernet), an
    /// empty pcapng the first of them (libpcap refuses a pcapng without an interface).
    pub fn finish(self, ifaces: &[Interface]) -> Result<W, WriteError> {
        match self.inner {
            Inner::PendingPcap(w, p) => {
                let w = w.expect("pending writer present");
                let (lt, snap) =
                    ifaces.first().map(|i| (i.linktype, i.snaplen)).unwrap_or((LinkType::ETHERNET, 262_144));
                PcapWriter::new(w, lt, self.snaplen.unwrap_or(snap), p)?.finish()
            }
            Inner::Pcap(w) => w.finish(),
            Inner::PcapNg(mut w, forced) => {
                if w.interface_count() == 0 {
                    match ifaces {
                        [] => {
                            let snap = self.snaplen.unwrap_or(262_144);
                            w.add_interface(LinkType::ETHERNET, snap, forced.unwrap_or(TsPrecision::Micro), None)?;
                        }
                        _ => {
                            let mut tw = TraceWriter { inner: Inner::PcapNg(w, forced), snaplen: self.snaplen };
                            // The first interface only: libpcap refuses a pcapng whose interfaces differ in
                            // link type, and no packet needs the others.
                            tw.declare(&ifaces[..1])?;
                            let Inner::PcapNg(done, _) = tw.inner else { unreachable!("declared into pcapng") };
                            return done.finish();
                        }
                    }
                }
                w.finish()
            }
        }
    }
}

/// A compressing [`Write`] adapter whose `finish` writes the end of the stream.
#[allow(missing_debug_implementations)]
pub enum Compressor<W: Write> {
    /// No compression.
    None(W),
    /// gzip.
    Gzip(flate2::write::GzEncoder<W>),
    /// Zstandard.
    Zstd(zstd::stream::write::Encoder<'static, W>),
    /// LZ4 frame.
    Lz4(lz4_flex::frame::FrameEncoder<W>),
}

impl<W: Write> Compressor<W> {
    /// Wraps `w` to compress with `c` (or not at all).
    pub fn new(w: W, c: Option<Compression>) -> io::Result<Compressor<W>> {
        Ok(match c {
            None => Compressor::None(w),
            Some(Compression::Gzip) => Compressor::Gzip(flate2::write::GzEncoder::new(w, flate2::Compression::new(6))),
            Some(Compression::Zstd) => Compressor::Zstd(zstd::stream::write::Encoder::new(w, 3)?),
            Some(Compression::Lz4) => Compressor::Lz4(lz4_flex::frame::FrameEncoder::new(w)),
        })
    }

    /// Ends the compressed stream and returns the inner writer.
    pub fn finish(self) -> io::Result<W> {
        match self {
            Compressor::None(w) => Ok(w),
            Compressor::Gzip(e) => e.finish(),
            Compressor::Zstd(e) => e.finish(),
            Compressor::Lz4(e) => e.finish().map_err(io::Error::other),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Compressor::None(w) => w.write(buf),
            Compressor::Gzip(e) => e.write(buf),
            Compressor::Zstd(e) => e.write(buf),
            Compressor::Lz4(e) => e.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Compressor::None(w) => w.flush(),
            Compressor::Gzip(e) => e.flush(),
            Compressor::Zstd(e) => e.flush(),
            Compressor::Lz4(e) => e.flush(),
        }
    }
}
