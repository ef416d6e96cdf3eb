//! Reader and writer properties: what a writer writes reads back exactly, in both formats and both precisions;
//! a file cut anywhere delivers every complete record and then one error; arbitrary bytes never panic.

use proptest::prelude::*;

use crate::{LinkType, PcapNgWriter, PcapWriter, Records, TraceReader, TsPrecision};

#[derive(Debug, Clone)]
struct Pkt {
    iface: u32,
    ts_ns: u64,
    wirelen_extra: u32,
    data: Vec<u8>,
}

fn pkts() -> impl Strategy<Value = Vec<Pkt>> {
    proptest::collection::vec(
        (0u32..3, 0u64..4_000_000_000_000_000_000, 0u32..100, proptest::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(iface, ts_ns, wirelen_extra, data)| Pkt { iface, ts_ns, wirelen_extra, data }),
        0..40,
    )
}

fn truncate(ts: u64, p: TsPrecision) -> u64 {
    match p {
        TsPrecision::Micro => ts / 1000 * 1000,
        TsPrecision::Nano => ts,
    }
}

fn write_pcap(pkts: &[Pkt], p: TsPrecision) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET, 65535, p).unwrap();
    for k in pkts {
        w.write_packet(k.ts_ns, k.data.len() as u32 + k.wirelen_extra, &k.data).unwrap();
    }
    w.finish().unwrap()
}

fn write_pcapng(pkts: &[Pkt]) -> Vec<u8> {
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.add_interface(LinkType::ETHERNET, 0, TsPrecision::Micro, Some("eth0")).unwrap();
    w.add_interface(LinkType::RAW, 1500, TsPrecision::Nano, None).unwrap();
    w.add_interface(LinkType::LINUX_SLL2, 65535, TsPrecision::Nano, Some("any")).unwrap();
    for k in pkts {
        w.write_packet(k.iface, k.ts_ns, k.data.len() as u32 + k.wirelen_extra, &k.data).unwrap();
    }
    w.finish().unwrap()
}

proptest! {
    #[test]
    fn pcap_reads_back(pkts in pkts(), nano: bool) {
        let p = if nano { TsPrecision::Nano } else { TsPrecision::Micro };
        let bytes = write_pcap(&pkts, p);
        let recs: Vec<_> = Records::new(&bytes).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(recs.len(), pkts.len());
        let mut off = 24u64;
        for (r, k) in recs.iter().zip(&pkts) {
            prop_assert_eq!(r.ts_ns, truncate(k.ts_ns, p));
            prop_assert_eq!(r.data, &k.data[..]);
            prop_assert_eq!(r.wirelen, k.data.len() as u32 + k.wirelen_extra);
            prop_assert_eq!(r.offset, off);
            off += u64::from(r.record_len);
        }
    }

    #[test]
    fn pcapng_reads_back(pkts in pkts()) {
        let bytes = write_pcapng(&pkts);
        let recs: Vec<_> = Records::new(&bytes).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(recs.len(), pkts.len());
        for (r, k) in recs.iter().zip(&pkts) {
            let p = if k.iface == 0 { TsPrecision::Micro } else { TsPrecision::Nano };
            prop_assert_eq!(r.ts_ns, truncate(k.ts_ns, p));
            prop_assert_eq!(r.iface, k.iface);
            prop_assert_eq!(r.linktype, [LinkType::ETHERNET, LinkType::RAW, LinkType::LINUX_SLL2][k.iface as usize]);
            prop_assert_eq!(r.data, &k.data[..]);
        }
    }

    /// Cut anywhere: every record that ends before the cut is delivered, then exactly one error (or a clean end
    /// when the cut falls between records), through both the slice and the stream reader.
    #[test]
    fn cut_files_deliver_the_complete_prefix(pkts in pkts(), ng: bool, cut_frac in 0.0f64..1.0) {
        let bytes = if ng { write_pcapng(&pkts) } else { write_pcap(&pkts, TsPrecision::Nano) };
        let full: Vec<_> = Records::new(&bytes).collect::<Result<Vec<_>, _>>().unwrap();
        let cut = (bytes.len() as f64 * cut_frac) as usize;
        let part = &bytes[..cut];
        let complete = full.iter().filter(|r| r.offset + u64::from(r.record_len) <= cut as u64).count();
        // Structure boundaries: after the pcap header and each record, or after each pcapng block.
        let mut bounds = vec![];
        if ng {
            let mut at = 0;
            while at < bytes.len() {
                at += u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
                bounds.push(at);
            }
        } else {
            bounds.push(24);
            bounds.extend(full.iter().map(|r| (r.offset + u64::from(r.record_len)) as usize));
        }
        let boundary = bounds.contains(&cut);
        let mut slice = Records::new(part);
        let mut stream = TraceReader::from_reader(Box::new(std::io::Cursor::new(part.to_vec())), None).unwrap();
        for expected in full.iter().take(complete) {
            let a = slice.next().unwrap().unwrap();
            let b = stream.next_record().unwrap().unwrap();
            prop_assert_eq!(a, *expected);
            prop_assert_eq!(b, *expected);
        }
        let a = slice.next();
        let b = stream.next_record().map(|r| r.map(|_| ()));
        if boundary {
            prop_assert!(a.is_none(), "clean end expected at a record boundary");
            prop_assert!(b.is_none());
        } else {
            let ea = a.unwrap().unwrap_err();
            let eb = b.unwrap().unwrap_err();
            prop_assert_eq!(ea.offset, eb.offset);
            prop_assert_eq!(ea.kind.to_string(), eb.kind.to_string());
            prop_assert!(slice.next().is_none());
            prop_assert!(stream.next_record().is_none());
        }
    }

    #[test]
    fn nth_record_at_equals_the_walk_record_by_record(
        pkts in pkts(), ng: bool, from in 0usize..40, n in 0usize..40, cut_frac in 0.5f64..1.0,
        flip: Option<(usize, usize, u8)>,
    ) {
        // A whole or cut file, perhaps with a byte of a record's length changed (it may then be too large, or run
        // past the end, or land elsewhere): the measured walk finds what reading record by record finds, or fails
        // the same way.
        let mut bytes = if ng { write_pcapng(&pkts) } else { write_pcap(&pkts, TsPrecision::Micro) };
        let (offsets, seeker) = {
            let mut records = Records::new(&bytes).track_structure();
            let offsets: Vec<u64> = records.by_ref().map(|r| r.unwrap().offset).collect();
            (offsets, crate::Seeker::new(&bytes, records.structure()).unwrap())
        };
        prop_assume!(from < offsets.len());
        let start = offsets[from];
        if let Some((r, b, x)) = flip {
            // The captured length of a pcap record (bytes 8-11), the total length of a pcapng block (4-7).
            let at = offsets[from + r % (offsets.len() - from)] as usize;
            bytes[at + if ng { 4 } else { 8 } + b % 4] ^= x | 1;
        }
        let cut = (start as usize).max((bytes.len() as f64 * cut_frac) as usize);
        let data = &bytes[..cut];
        let walked = (|| -> Result<(crate::Record<'_>, u64), crate::TraceError> {
            let mut off = start;
            let mut k = 0;
            loop {
                let rec = seeker.next_record_at(data, off)?;
                off = rec.offset + u64::from(rec.record_len);
                if k == n {
                    return Ok((rec, off));
                }
                k += 1;
            }
        })();
        match (seeker.nth_record_at(data, start, n), walked) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(a), Err(b)) => {
                prop_assert_eq!(a.offset, b.offset);
                prop_assert_eq!(a.kind.to_string(), b.kind.to_string());
            }
            (a, b) => prop_assert!(false, "measured {:?}, walked {:?}", a, b),
        }
    }

    #[test]
    fn many_walks_at_once_end_where_each_walk_alone_ends(
        pkts in pkts(), ng: bool, walks in proptest::collection::vec((0usize..40, 0usize..40), 0..80),
        cut_frac in 0.5f64..1.0, flip: Option<(usize, usize, u8)>,
    ) {
        // A whole or cut file, perhaps with a record's length changed: each walk, finished by `nth_record_at` from
        // where the many walks left it, finds what `nth_record_at` finds alone, or fails the same way; and a walk
        // the many walks finished ends at a record `nth_record_at` reads there.
        let mut bytes = if ng { write_pcapng(&pkts) } else { write_pcap(&pkts, TsPrecision::Micro) };
        let (offsets, seeker) = {
            let mut records = Records::new(&bytes).track_structure();
            let offsets: Vec<u64> = records.by_ref().map(|r| r.unwrap().offset).collect();
            (offsets, crate::Seeker::new(&bytes, records.structure()).unwrap())
        };
        prop_assume!(!offsets.is_empty());
        if let Some((r, b, x)) = flip {
            let at = offsets[r % offsets.len()] as usize;
            bytes[at + if ng { 4 } else { 8 } + b % 4] ^= x | 1;
        }
        let cut = (offsets[0] as usize).max((bytes.len() as f64 * cut_frac) as usize);
        let data = &bytes[..cut];
        let starts: Vec<(u64, usize)> = walks.iter().map(|&(from, n)| (offsets[from % offsets.len()], n)).collect();
        let mut many = starts.clone();
        prop_assert_eq!(seeker.skip_records_many(data, &mut many), !ng);
        for (&(start, n), &(at, left)) in starts.iter().zip(&many) {
            prop_assert!(left <= n);
            if ng {
                prop_assert_eq!((at, left), (start, n));
            }
            match (seeker.nth_record_at(data, at, left), seeker.nth_record_at(data, start, n)) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => {
                    prop_assert_eq!(a.offset, b.offset);
                    prop_assert_eq!(a.kind.to_string(), b.kind.to_string());
                }
                (a, b) => prop_assert!(false, "many {:?}, alone {:?}", a, b),
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(prefix in prop_oneof![
            Just(vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]),
            Just(vec![0xa1, 0xb2, 0x3c, 0x4d, 0, 2, 0, 4]),
            Just(vec![0x0a, 0x0d, 0x0d, 0x0a]),
            Just(vec![])],
        body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut bytes = prefix;
        bytes.extend_from_slice(&body);
        for r in Records::new(&bytes) {
            if r.is_err() { break; }
        }
        let mut s = TraceReader::from_reader(Box::new(std::io::Cursor::new(bytes)), None).unwrap();
        while let Some(Ok(_)) = s.next_record() {}
    }
}

#[test]
fn big_endian_legacy_pcap_is_read_correctly() {
    // The pitfall of pcap-parser 0.17's slice iterator: a big-endian file must give the same values.
    let data = include_bytes!("../../../../testdata/pcap-be-ns.pcap");
    let recs: Vec<_> = Records::new(data).collect::<Result<_, _>>().unwrap();
    assert_eq!(recs.len(), 3);
    assert_eq!(recs[1].ts_ns, 1_700_000_000_000_001_007);
    assert_eq!(recs[1].linktype, LinkType::LINUX_SLL);
    assert_eq!(recs[1].wirelen, recs[1].caplen());
    assert_eq!(recs[2].offset, 24 + 2 * (16 + 44));
}
