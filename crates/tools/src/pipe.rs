//! Reading a trace record by record into a sink, through the caller's transformation.

use std::path::Path;

use pcaptool_engine::{Layout, NativeFormat, Sink};
use pcaptool_packet::{FileFormat, Interface, Record, TraceError, TraceReader, TsPrecision, precision_for};

use crate::ToolError;

/// What [`copy_through`] did.
#[derive(Debug, Default)]
pub struct Copied {
    /// Records read.
    pub read: u64,
    /// Records given to the sink.
    pub written: u64,
    /// The damage that ended reading early, if the trace is damaged (the records before it were copied).
    pub damage: Option<TraceError>,
}

/// The container a trace's records come from.
pub(crate) fn native(reader: &TraceReader) -> NativeFormat {
    match reader.format() {
        Some(FileFormat::Pcap { precision, .. }) => NativeFormat::Pcap(precision),
        Some(FileFormat::PcapNg { .. }) => NativeFormat::PcapNg,
        None => {
            NativeFormat::Pcap(reader.interfaces().first().map_or(TsPrecision::Micro, |i| precision_for(i.tsresol)))
        }
    }
}

/// The next record of `reader` and its interfaces, counted in `done.read`; `None` at the end, or at damage, which
/// is kept in `done.damage`. `progress` gets the stream offset now and then.
pub(crate) fn next<'r>(
    reader: &'r mut TraceReader,
    done: &mut Copied,
    progress: &dyn Fn(u64),
) -> Option<(Record<'r>, &'r [Interface])> {
    match reader.next_with_interfaces()? {
        Err(e) => {
            done.damage = Some(e);
            None
        }
        Ok((rec, ifaces)) => {
            done.read += 1;
            if done.read.is_multiple_of(1 << 16) {
                progress(rec.offset);
            }
            Some((rec, ifaces))
        }
    }
}

/// Opens `path` and reads its header.
pub(crate) fn open(path: &Path) -> Result<TraceReader, ToolError> {
    let read = |source| ToolError::Read { path: path.to_path_buf(), source };
    let mut r = TraceReader::open(path).map_err(read)?;
    r.read_header().map_err(read)?;
    Ok(r)
}

/// Writes one record to the output.
pub type Emit<'e> = dyn FnMut(&Record<'_>) -> Result<(), ToolError> + 'e;

/// The caller's step of [`copy_through`]: given a record, its interfaces and the output, writes what it keeps;
/// false stops.
pub type Step<'s> = dyn FnMut(&Record<'_>, &[Interface], &mut Emit<'_>) -> Result<bool, ToolError> + 's;

/// Copies the records of `path` into `sink` through `f`, which writes each record it keeps (possibly changed)
/// with the function it is given, and returns false to stop. `progress` gets the stream offset now and then.
pub fn copy_through(
    path: &Path,
    sink: &mut dyn Sink,
    progress: &dyn Fn(u64),
    f: &mut Step<'_>,
) -> Result<Copied, ToolError> {
    let mut reader = open(path)?;
    let layout_ifaces = reader.interfaces().to_vec();
    let complete = matches!(reader.format(), Some(FileFormat::Pcap { .. }));
    sink.begin(&Layout { interfaces: &layout_ifaces, native: native(&reader), complete })?;
    let mut done = Copied::default();
    let result = (|| -> Result<(), ToolError> {
        while let Some((rec, ifaces)) = next(&mut reader, &mut done, progress) {
            let mut written = 0u64;
            let go_on = f(&rec, ifaces, &mut |r: &Record<'_>| {
                sink.record(r, ifaces)?;
                written += 1;
                Ok(())
            })?;
            done.written += written;
            if !go_on {
                break;
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            sink.finish(reader.interfaces())?;
            Ok(done)
        }
        Err(e) => {
            sink.abandon();
            Err(e)
        }
    }
}
