//! The Parquet export's manifest (`_pcaptool_manifest.json`), a file anyone with access to a shared export
//! directory can change: parsing never panics, and a manifest it accepts writes back as bytes that parse to the
//! same segments.
#![no_main]

use std::path::Path;

use pcaptool_export::Manifest;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = Path::new("/data/net/_pcaptool_manifest.json");
    if let Ok(m) = Manifest::parse(data, path) {
        let again = Manifest::parse(&m.to_bytes(), path).expect("a manifest written parses");
        assert_eq!(again.segments(), m.segments());
    }
});
