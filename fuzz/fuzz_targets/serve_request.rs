//! The query service's request decoding: any bytes as a query body, and as the query string of
//! `GET /v1/flows`. Decoding never panics; a request it accepts has the filter it was sent, which parses again
//! to the same expression, and a packet limit no higher than the service's.
#![no_main]

use pcaptool_serve::Limits;
use pcaptool_serve::api::{Query, parse_flows_query, parse_query};

fn check(q: Query) {
    assert!(q.request.limit.is_some_and(|l| l <= 1000));
    let again = pcaptool_query::Filter::new(&q.body.filter).expect("an accepted filter parses again");
    let f = q.request.filter.expect("a request has its filter");
    assert_eq!(f.text(), q.body.filter);
    assert_eq!(format!("{:?}", f.expr()), format!("{:?}", again.expr()));
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let limits = Limits { packets: Some(1000), ..Limits::default() };
    if let Ok(q) = parse_query(data, &limits) {
        check(q);
    }
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(q) = parse_flows_query(s, &limits)
    {
        check(q);
    }
});
