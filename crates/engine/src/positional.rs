//! A pcap output written at offsets computed in advance, by every thread at once (pcapWT's parallel extraction),
//! and the arenas that carry records to it.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;

use pcaptool_packet::{Interface, OutputFormat, Record, TraceWriter, TsPrecision, WriteError, pcap_record_header};
use rayon::prelude::*;

use crate::SinkError;

/// A pcap file whose records are placed by offset: each wave of matches is sized first, then every part is
/// encoded and written at its place by its own thread. The bytes are those [`TraceWriter`] writes.
#[derive(Debug)]
pub struct Positional {
    file: File,
    /// The output's name in errors.
    name: String,
    precision: TsPrecision,
    /// Where the next record goes.
    next: u64,
    /// Whether the output is a regular file (its bytes copied into its pages, its length cut at the end), not a
    /// device such as /dev/null.
    regular: bool,
}

impl Positional {
    /// Writes the file header, the one [`TraceWriter`] writes for a trace of these interfaces.
    pub fn start(
        file: File,
        name: &str,
        precision: TsPrecision,
        ifaces: &[Interface],
    ) -> Result<Positional, SinkError> {
        let error = |source| SinkError::Write { to: name.to_string(), source };
        let header = TraceWriter::new(Vec::new(), OutputFormat::Pcap(precision)).and_then(|w| w.finish(ifaces));
        let header = header.map_err(error)?;
        file.write_all_at(&header, 0).map_err(|e| error(WriteError::Io(e)))?;
        let regular = file.metadata().map_err(|e| error(WriteError::Io(e)))?.is_file();
        Ok(Positional { file, name: name.to_string(), precision, next: header.len() as u64, regular })
    }

    fn error(&self, source: WriteError) -> SinkError {
        SinkError::Write { to: self.name.clone(), source }
    }

    /// Whether writing costs time of its own: a regular file's bytes are copied into its pages (a device such as
    /// /dev/null takes them for nothing).
    pub(crate) fn writes_cost(&self) -> bool {
        self.regular
    }

    /// Ends the file where the last record ends (a file that was longer is cut).
    pub fn finish(self) -> io::Result<()> {
        if self.regular { self.file.set_len(self.next) } else { Ok(()) }
    }

    /// Writes headed arenas (see [`Arena`]) one after another, each in one write by its own thread.
    pub(crate) fn write_arenas(&mut self, arenas: &mut [Arena]) -> Result<(), SinkError> {
        let mut starts = Vec::with_capacity(arenas.len());
        for a in arenas.iter() {
            starts.push(self.next);
            self.next += a.data.len() as u64;
        }
        let file = &self.file;
        let precision = self.precision;
        arenas
            .par_iter_mut()
            .zip(starts)
            .try_for_each(|(a, at)| -> Result<(), WriteError> {
                debug_assert!(a.headed, "an arena without room for its records' headers");
                for (m, r) in &a.records {
                    let h = pcap_record_header(precision, m.ts_ns, m.wirelen, r.len())?;
                    a.data[r.start - 16..r.start].copy_from_slice(&h);
                }
                file.write_all_at(&a.data, at)?;
                Ok(())
            })
            .map_err(|e| self.error(e))
    }

    /// Writes consecutive lists of records, each list by its own thread.
    pub(crate) fn write(&mut self, lists: &[Vec<Record<'_>>]) -> Result<(), SinkError> {
        let mut starts = Vec::with_capacity(lists.len());
        for l in lists {
            starts.push(self.next);
            self.next += l.iter().map(|r| 16 + r.data.len() as u64).sum::<u64>();
        }
        let file = &self.file;
        let precision = self.precision;
        lists
            .par_iter()
            .zip(starts)
            .try_for_each(|(l, at)| write_list(file, precision, l, at, None))
            .map_err(|e| self.error(e))
    }

    /// Writes records next, from this thread. Records read from `source` (the mapped trace, when they were) whose
    /// bytes there are already the output's (a pcap trace in this byte order and precision, the packet not cut)
    /// are written from it, with no copy of ours: a long run in a write of its own, shorter runs listed for one
    /// gathered write. (Measured on the real-traffic trace, `tcp` into /dev/shm: runs gathered, 0.346-0.358 s
    /// best of 7 against 0.359-0.376 s with the short runs copied into a buffer first; where runs are short, as
    /// under a selective filter, the check costs more than it saves, so the parallel writers skip it.)
    pub(crate) fn append(&mut self, list: &[Record<'_>], source: Option<&[u8]>) -> Result<(), SinkError> {
        let at = self.next;
        self.next += list.iter().map(|r| 16 + r.data.len() as u64).sum::<u64>();
        write_list(&self.file, self.precision, list, at, source).map_err(|e| self.error(e))
    }
}

/// Writes `list`'s records from byte `at` of `file`, runs of them straight from `source` where they are already
/// the output's bytes (see [`Positional::append`]).
fn write_list(
    file: &File,
    precision: TsPrecision,
    list: &[Record<'_>],
    at: u64,
    source: Option<&[u8]>,
) -> Result<(), WriteError> {
    let mut out = Out::new(file, at);
    let Some(src) = source else {
        for r in list {
            out.copy(&[&pcap_record_header(precision, r.ts_ns, r.wirelen, r.data.len())?, r.data])?;
        }
        return out.flush();
    };
    // Source bytes of consecutive verbatim records not yet written.
    let mut run = 0..0;
    for r in list {
        let h = pcap_record_header(precision, r.ts_ns, r.wirelen, r.data.len())?;
        match verbatim(src, r, &h) {
            Some(span) if span.start == run.end && !run.is_empty() => run.end = span.end,
            Some(span) => out.source(src, std::mem::replace(&mut run, span))?,
            None => {
                out.source(src, std::mem::replace(&mut run, 0..0))?;
                out.copy(&[&h, r.data])?;
            }
        }
    }
    out.source(src, run)?;
    out.flush()
}

/// Bytes gathered for one positional write (1 MiB), and the least run of source bytes written on its own rather
/// than listed with others (a write of its own costs a system call).
const BUF: usize = 1 << 20;
const DIRECT: usize = 256 << 10;
/// Source runs listed for one gathered write (Linux's `IOV_MAX`).
const IOV: usize = 1024;

/// The output of one list of records: where its next byte goes, and the bytes gathered for it, either copied
/// (`buf`) or listed where they lie in the source (`iov`, written by one `pwritev` with no copy of ours); one of
/// the two is empty, so that the bytes go out in order.
struct Out<'f, 's> {
    file: &'f File,
    at: u64,
    buf: Vec<u8>,
    iov: Vec<IoSlice<'s>>,
    listed: usize,
}

impl<'f, 's> Out<'f, 's> {
    fn new(file: &'f File, at: u64) -> Out<'f, 's> {
        Out { file, at, buf: Vec::new(), iov: Vec::new(), listed: 0 }
    }

    fn flush(&mut self) -> Result<(), WriteError> {
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.at)?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
        }
        let mut slices = &mut self.iov[..];
        while !slices.is_empty() {
            match rustix::io::pwritev(self.file, slices, self.at) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => {
                    self.at += n as u64;
                    IoSlice::advance_slices(&mut slices, n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io::Error::from(e).into()),
            }
        }
        self.iov.clear();
        self.listed = 0;
        Ok(())
    }

    fn copy(&mut self, parts: &[&[u8]]) -> Result<(), WriteError> {
        if !self.iov.is_empty() {
            self.flush()?;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve(BUF);
        }
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        if self.buf.len() >= BUF { self.flush() } else { Ok(()) }
    }

    /// `source[span]`: written from where it is, listed with others when short.
    fn source(&mut self, source: &'s [u8], span: std::ops::Range<usize>) -> Result<(), WriteError> {
        let bytes = &source[span];
        if bytes.is_empty() {
            return Ok(());
        }
        if !self.buf.is_empty() || bytes.len() >= DIRECT {
            self.flush()?;
        }
        if bytes.len() >= DIRECT {
            self.file.write_all_at(bytes, self.at)?;
            self.at += bytes.len() as u64;
            return Ok(());
        }
        self.iov.push(IoSlice::new(bytes));
        self.listed += bytes.len();
        if self.iov.len() == IOV || self.listed >= BUF { self.flush() } else { Ok(()) }
    }
}

/// Where `r`'s output bytes (its pcap record `header`, then its data) lie in `source` as they are, if they do:
/// the record was read from there, its header bytes are these, and its data follows it uncut.
fn verbatim(source: &[u8], r: &Record<'_>, header: &[u8; 16]) -> Option<std::ops::Range<usize>> {
    let start = usize::try_from(r.offset).ok()?;
    let end = start.checked_add(16)?.checked_add(r.data.len())?;
    let (h, data) = source.get(start..end)?.split_at(16);
    (h == header && std::ptr::eq(data.as_ptr(), r.data.as_ptr())).then_some(start..end)
}

/// Records copied out of a reused read buffer, kept until they are written. For a [`Positional`] output each
/// record's data follows 16 bytes left for its pcap record header, so that the arena's bytes become the output's
/// bytes in place and go out in one write (a second buffer would cost a copy and its fresh pages).
pub(crate) struct Arena {
    data: Vec<u8>,
    records: Vec<(Record<'static>, std::ops::Range<usize>)>,
    /// Whether each record has room for its header before it.
    headed: bool,
}

impl Arena {
    pub(crate) fn new(headed: bool) -> Arena {
        Arena { data: Vec::new(), records: Vec::new(), headed }
    }

    pub(crate) fn push(&mut self, rec: &Record<'_>) {
        if self.headed {
            self.data.extend_from_slice(&[0; 16]);
        }
        let start = self.data.len();
        self.data.extend_from_slice(rec.data);
        let meta = Record {
            ts_ns: rec.ts_ns,
            has_ts: rec.has_ts,
            wirelen: rec.wirelen,
            iface: rec.iface,
            linktype: rec.linktype,
            offset: rec.offset,
            record_len: rec.record_len,
            data: &[],
        };
        self.records.push((meta, start..self.data.len()));
    }

    /// Keeps the first `n` records; returns how many it holds.
    pub(crate) fn truncate(&mut self, n: usize) -> usize {
        self.records.truncate(n);
        self.data.truncate(self.records.last().map_or(0, |(_, r)| r.end));
        self.records.len()
    }

    pub(crate) fn records(&self) -> Vec<Record<'_>> {
        self.records.iter().map(|(m, r)| Record { data: &self.data[r.clone()], ..*m }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One step of an output: bytes copied, or a span of the source written from where it lies.
    #[derive(Debug, Clone)]
    enum Step {
        Copy(Vec<u8>),
        Source(usize, usize),
    }

    fn step(source_len: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Step::Copy),
            // Mostly short spans (many of them fill a gathered write's 1,024 slices), some past `DIRECT`.
            8 => (0..source_len, 0usize..2048).prop_map(move |(a, n)| Step::Source(a, (a + n).min(source_len))),
            1 => (0..source_len / 2, DIRECT..DIRECT + 4096).prop_map(|(a, n)| Step::Source(a, a + n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever mix of copied bytes, gathered runs and direct runs, the file holds exactly their
        /// concatenation from the offset asked, and nothing before it is touched.
        #[test]
        fn out_writes_every_byte_in_order(steps in proptest::collection::vec(step(1 << 20), 0..4000), at in 0u64..100) {
            let source: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            let path = std::env::temp_dir().join(format!("pcaptool-out-{}-{at}-{}.bin", std::process::id(), steps.len()));
            let file = File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            file.write_all_at(&vec![0xAA; at as usize], 0).unwrap();
            let mut want = vec![0xAA; at as usize];
            let mut out = Out::new(&file, at);
            for s in &steps {
                match s {
                    Step::Copy(b) => {
                        want.extend_from_slice(b);
                        out.copy(&[b]).unwrap();
                    }
                    Step::Source(a, e) => {
                        want.extend_from_slice(&source[*a..*e]);
                        out.source(&source, *a..*e).unwrap();
                    }
                }
            }
            out.flush().unwrap();
            let got = std::fs::read(&path).unwrap();
            let _ = std::fs::remove_file(&path);
            prop_assert_eq!(out.at, want.len() as u64);
            prop_assert!(got == want, "{} bytes written, {} expected", got.len(), want.len());
        }
    }
}
