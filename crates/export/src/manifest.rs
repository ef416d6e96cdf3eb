//! The export directory's manifest (`_pcaptool_manifest.json`, docs/format/export.md): which segments of which
//! store and sensor are exported, and their files. It is written aside and renamed into place (at most once a
//! second while an export runs, and at its end), so it always lists whole segments; a CRC-32C over its list
//! catches a file changed by hand or damaged.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ExportError;

/// The manifest's name in an export directory (engines skip names starting with `_`).
pub const MANIFEST: &str = "_pcaptool_manifest.json";

/// What the `format` field holds.
const FORMAT: &str = "pcaptool-export";
/// The version this code writes and reads.
const VERSION: u32 = 2;

/// One segment exported: where its flows went, and its packets if they were asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedSegment {
    /// The sensor's name (the first partition level).
    pub sensor: String,
    /// The store's name.
    pub store: String,
    /// The segment's number in its store.
    pub segment: u32,
    /// Its flow table's rows: the flows (parts of flows) with packets in the segment.
    pub flows: Option<Written>,
    /// Its packet table's rows, one per packet (`--packets`).
    pub packets: Option<Written>,
}

/// The rows of one table of one segment, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// Rows written.
    pub rows: u64,
    /// Their files, relative to the export directory, `/`-separated (none for PostgreSQL).
    pub files: Vec<String>,
    /// Bytes of those files (or of the rows sent to PostgreSQL, in its binary COPY format).
    pub bytes: u64,
}

/// The manifest as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    format: String,
    version: u32,
    /// CRC-32C of `segments` serialized compactly, in hexadecimal.
    crc32c: String,
    segments: Vec<ExportedSegment>,
}

/// The segments an export directory holds.
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    segments: Vec<ExportedSegment>,
}

fn crc_of(segments: &[ExportedSegment]) -> String {
    let bytes = serde_json::to_vec(segments).unwrap_or_default();
    format!("{:08x}", crc32c::crc32c(&bytes))
}

impl Manifest {
    /// The manifest of the export directory `dir` (empty when there is none yet).
    pub fn load(dir: &Path) -> Result<Manifest, ExportError> {
        let path = dir.join(MANIFEST);
        match std::fs::read(&path) {
            Ok(text) => Manifest::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::default()),
            Err(e) => Err(ExportError::io(&path, e)),
        }
    }

    /// A manifest from its bytes (`path` names it in errors): checked for its format, version and checksum.
    pub fn parse(text: &[u8], path: &Path) -> Result<Manifest, ExportError> {
        let bad = |why: String| ExportError::Manifest { path: path.to_path_buf(), why };
        let stored: Stored = serde_json::from_slice(text).map_err(|e| bad(format!("not its JSON: {e}")))?;
        if stored.format != FORMAT {
            return Err(bad(format!("its format is {:?}, not {FORMAT:?}", stored.format)));
        }
        if stored.version != VERSION {
            return Err(bad(format!("version {} (this pcaptool reads version {VERSION})", stored.version)));
        }
        let crc = crc_of(&stored.segments);
        if stored.crc32c != crc {
            return Err(bad(format!("its checksum is {}, its list's is {crc}", stored.crc32c)));
        }
        Ok(Manifest { segments: stored.segments })
    }

    /// A manifest listing `segments` (the last of a sensor, store and segment number counts).
    pub fn from_segments(segments: Vec<ExportedSegment>) -> Manifest {
        let mut m = Manifest::default();
        for s in segments {
            m.add(s);
        }
        m
    }

    /// Every segment listed, in the order exported.
    pub fn segments(&self) -> &[ExportedSegment] {
        &self.segments
    }

    /// What of segment `segment` of `store` is exported for `sensor`.
    pub fn get(&self, sensor: &str, store: &str, segment: u32) -> Option<&ExportedSegment> {
        self.segments.iter().find(|s| s.sensor == sensor && s.store == store && s.segment == segment)
    }

    /// Lists `seg`: the tables it names replace those listed of the same segment, the others stay.
    pub(crate) fn add(&mut self, mut seg: ExportedSegment) {
        if let Some(i) = self
            .segments
            .iter()
            .position(|s| s.sensor == seg.sensor && s.store == seg.store && s.segment == seg.segment)
        {
            let old = self.segments.remove(i);
            seg.flows = seg.flows.or(old.flows);
            seg.packets = seg.packets.or(old.packets);
        }
        self.segments.push(seg);
    }

    /// The manifest's bytes, as an export writes them into its directory.
    pub fn to_bytes(&self) -> Vec<u8> {
        let stored = Stored {
            format: FORMAT.to_string(),
            version: VERSION,
            crc32c: crc_of(&self.segments),
            segments: self.segments.clone(),
        };
        let mut text = serde_json::to_vec_pretty(&stored).unwrap_or_default();
        text.push(b'\n');
        text
    }

    /// Writes the manifest into `dir`: aside, synced, then renamed over the old one.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), ExportError> {
        let path = dir.join(MANIFEST);
        let tmp = dir.join(format!(".{MANIFEST}.tmp"));
        let text = self.to_bytes();
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()
        };
        write().map_err(|e| ExportError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| ExportError::io(&path, e))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| ExportError::io(dir, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(n: u32) -> ExportedSegment {
        ExportedSegment {
            sensor: "s".into(),
            store: "st".into(),
            segment: n,
            flows: Some(Written {
                rows: u64::from(n) * 3,
                files: vec![format!("flows/sensor=s/date=2026-01-01/hour=00/part-st-{n:06}.parquet")],
                bytes: 100,
            }),
            packets: None,
        }
    }

    #[test]
    fn reads_back_and_refuses_what_it_did_not_write() {
        let dir = std::env::temp_dir().join(format!("pcaptool-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Manifest::load(&dir).unwrap().segments().is_empty(), "no manifest: nothing exported");
        let mut m = Manifest::default();
        m.add(seg(1));
        m.add(seg(2));
        m.add(seg(1));
        m.save(&dir).unwrap();
        let back = Manifest::load(&dir).unwrap();
        assert_eq!(back.segments(), &[seg(2), seg(1)]);
        assert!(
            back.get("s", "st", 1).is_some() && back.get("s", "st", 3).is_none() && back.get("t", "st", 1).is_none()
        );
        // Packets exported later join the segment's flows; flows exported again replace them.
        let mut m = back;
        let packets = Written { rows: 9, files: vec!["packets/x.parquet".into()], bytes: 5 };
        m.add(ExportedSegment { flows: None, packets: Some(packets.clone()), ..seg(2) });
        assert_eq!(m.get("s", "st", 2), Some(&ExportedSegment { packets: Some(packets.clone()), ..seg(2) }));
        let again = ExportedSegment { flows: Some(Written::default()), ..seg(2) };
        m.add(again.clone());
        assert_eq!(m.get("s", "st", 2), Some(&ExportedSegment { packets: Some(packets), ..again }));
        assert_eq!(m.segments().len(), 2);
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).unwrap();
        // A count changed by hand: the checksum no longer holds.
        std::fs::write(&path, text.replace("\"rows\": 6", "\"rows\": 7")).unwrap();
        let e = Manifest::load(&dir).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains("move it aside"), "{e}");
        for (from, to, says) in
            [("\"version\": 2", "\"version\": 9", "version 9"), ("pcaptool-export", "other", "format")]
        {
            std::fs::write(&path, text.replace(from, to)).unwrap();
            let e = Manifest::load(&dir).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(Manifest::load(&dir).unwrap_err().to_string().contains("not its JSON"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
