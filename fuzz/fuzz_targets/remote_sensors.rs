//! The remote client's parsers of what a user hands it: a file of sensors, and a sensor's address. Parsing never
//! panics; an address it accepts prints as an address that parses back to the same endpoint, and every sensor of an
//! accepted file has a plain name and an address that does the same.
#![no_main]

use std::path::Path;

use pcaptool_remote::{Endpoint, parse_sensors};

fn round_trips(e: &Endpoint) {
    let again: Endpoint = e.to_string().parse().expect("a printed address parses");
    assert_eq!(&again, e);
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(e) = text.parse::<Endpoint>() {
        round_trips(&e);
    }
    if let Ok(sensors) = parse_sensors(text, Path::new("/etc/pcaptool/sensors")) {
        for s in &sensors {
            assert!(!s.name.is_empty() && !Endpoint::is_address(&s.name));
            round_trips(&s.endpoint);
        }
    }
});
