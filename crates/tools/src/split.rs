//! One trace into many: by packets, by bytes, by time interval (as `editcap -c` and `-i`), or by flow (each
//! flow whole in one of N files, chosen by a hash of its addresses and ports in either direction).

use std::path::{Path, PathBuf};

use pcaptool_engine::{Layout, Sink, TraceSink, WriteOptions};
use pcaptool_packet::{FileFormat, decode};

use crate::pipe::{native, next, open};
use crate::{Copied, ToolError};

/// Where one output ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// After this many packets.
    Packets(u64),
    /// Before the packet that would take it past this many bytes (records as stored: 16 bytes of header each,
    /// and the captured bytes).
    Bytes(u64),
    /// At every multiple of this many nanoseconds after the first packet's time (an interval without packets
    /// makes no file).
    Interval(u64),
    /// Into this many files by flow.
    Flows(u32),
}

/// The name of output `n`: `PREFIX-NNNNN.EXT`, the extension (and so format and compression) `ext`.
pub fn output_name(prefix: &Path, n: u64, ext: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{n:05}.{ext}"));
    PathBuf::from(name)
}

/// A hash of the packet's bidirectional flow key (addresses, ports, protocol, outer VLAN: the same both ways), 0
/// for packets without IP. FxHash: the same in every run.
fn flow_hash(linktype: pcaptool_packet::LinkType, data: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let Some((key, _)) = decode(linktype, data).flow() else { return 0 };
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// Splits `input` by `rule` into files named by [`output_name`]; returns the files written, in order, and
/// what was copied.
pub fn split(
    input: &Path,
    prefix: &Path,
    ext: &str,
    rule: Rule,
    progress: &dyn Fn(u64),
) -> Result<(Vec<PathBuf>, Copied), ToolError> {
    let mut reader = open(input)?;
    let ifaces0 = reader.interfaces().to_vec();
    let complete = matches!(reader.format(), Some(FileFormat::Pcap { .. }));
    let native = native(&reader);
    let mut files: Vec<PathBuf> = Vec::new();
    let open_sink = |n: u64, files: &mut Vec<PathBuf>| -> Result<TraceSink, ToolError> {
        let path = output_name(prefix, n, ext);
        let mut s = TraceSink::create(&path, WriteOptions::new())?;
        s.begin(&Layout { interfaces: &ifaces0, native, complete })?;
        files.push(path);
        Ok(s)
    };
    let mut done = Copied::default();
    // Sequential rules: one output at a time.
    let mut current: Option<(TraceSink, u64, u64)> = None; // sink, packets, bytes
    let mut next_n = 0u64;
    let mut boundary: Option<u64> = None;
    // Flows: all outputs open at once.
    let mut by_flow: Vec<Option<TraceSink>> = match rule {
        Rule::Flows(k) => (0..k.max(1)).map(|_| None).collect(),
        _ => Vec::new(),
    };
    let result = (|| -> Result<(), ToolError> {
        while let Some((rec, ifaces)) = next(&mut reader, &mut done, progress) {
            let size = 16 + rec.data.len() as u64;
            if let Rule::Flows(k) = rule {
                let i = (flow_hash(rec.linktype, rec.data) % u64::from(k.max(1))) as usize;
                if by_flow[i].is_none() {
                    by_flow[i] = Some(open_sink(i as u64, &mut files)?);
                }
                by_flow[i].as_mut().expect("opened").record(&rec, ifaces)?;
                done.written += 1;
                continue;
            }
            let new_file = match (&current, rule) {
                (None, _) => true,
                (Some((_, p, _)), Rule::Packets(n)) => *p >= n.max(1),
                (Some((_, p, b)), Rule::Bytes(n)) => *p > 0 && b + size > n,
                (Some(_), Rule::Interval(_)) => boundary.is_some_and(|t| rec.ts_ns >= t),
                (Some(_), Rule::Flows(_)) => unreachable!("flows are split above"),
            };
            if let Rule::Interval(iv) = rule {
                let iv = iv.max(1);
                match boundary {
                    None => boundary = Some(rec.ts_ns.saturating_add(iv)),
                    Some(t) if rec.ts_ns >= t => {
                        let steps = (rec.ts_ns - t) / iv + 1;
                        boundary = Some(t.saturating_add(steps.saturating_mul(iv)));
                    }
                    Some(_) => {}
                }
            }
            if new_file {
                if let Some((mut s, ..)) = current.take() {
                    s.finish(ifaces)?;
                }
                current = Some((open_sink(next_n, &mut files)?, 0, 0));
                next_n += 1;
            }
            let (s, p, b) = current.as_mut().expect("opened above");
            s.record(&rec, ifaces)?;
            *p += 1;
            *b += size;
            done.written += 1;
        }
        Ok(())
    })();
    let ifaces = reader.interfaces().to_vec();
    match result {
        Ok(()) => {
            if let Some((mut s, ..)) = current.take() {
                s.finish(&ifaces)?;
            }
            for s in by_flow.iter_mut().flatten() {
                s.finish(&ifaces)?;
            }
            if files.is_empty() {
                // An empty trace still gives one (empty) file that every tool opens.
                open_sink(0, &mut files)?.finish(&ifaces)?;
            }
            Ok((files, done))
        }
        Err(e) => {
            if let Some((mut s, ..)) = current.take() {
                s.abandon();
            }
            for s in by_flow.iter_mut().flatten() {
                s.abandon();
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(output_name(Path::new("out/part"), 7, "pcap.gz"), PathBuf::from("out/part-00007.pcap.gz"));
    }

    #[test]
    fn flow_hash_is_symmetric() {
        let mut p = vec![0u8; 14 + 20 + 8];
        p[12] = 0x08;
        p[14] = 0x45;
        p[23] = 17;
        p[26..30].copy_from_slice(&[10, 0, 0, 1]);
        p[30..34].copy_from_slice(&[10, 0, 0, 2]);
        p[34..36].copy_from_slice(&1000u16.to_be_bytes());
        p[36..38].copy_from_slice(&53u16.to_be_bytes());
        let mut q = p.clone();
        q[26..30].copy_from_slice(&[10, 0, 0, 2]);
        q[30..34].copy_from_slice(&[10, 0, 0, 1]);
        q[34..36].copy_from_slice(&53u16.to_be_bytes());
        q[36..38].copy_from_slice(&1000u16.to_be_bytes());
        let eth = pcaptool_packet::LinkType::ETHERNET;
        assert_eq!(flow_hash(eth, &p), flow_hash(eth, &q));
        assert_ne!(flow_hash(eth, &p), 0);
    }
}
