//! The service's requests, decoded from untrusted bytes: a query's JSON body, or the query string of
//! `GET /v1/flows`, into an engine request. Kept apart
//! from the HTTP side so that the fuzz target `serve_request` reaches it directly.

use pcaptool_engine::Request;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Limits;

/// A query's JSON body (`POST /v1/query`, `/v1/count`, `/v1/explain`); unknown fields are refused.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct QueryBody {
    /// A filter in tcpdump's language (empty: every packet).
    #[serde(default)]
    pub filter: String,
    /// Packets at or after this time: RFC 3339, or epoch seconds (a number or a string).
    pub after: Option<Value>,
    /// Packets before this time.
    pub before: Option<Value>,
    /// Packets at most.
    pub limit: Option<u64>,
    /// Bytes of packet data at most.
    pub max_bytes: Option<u64>,
    /// A store's flow id.
    pub flow: Option<u64>,
    /// `pcap` (the default; pcapng when link types differ) or `pcapng`.
    pub format: Option<String>,
    /// The source's name (needed when the service has several).
    pub source: Option<String>,
}

/// A query body decoded and its engine request built.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Query {
    /// The body as sent.
    pub body: QueryBody,
    /// The request for the engine: the filter parsed, the time window, the flow, the packet limit (the lower of
    /// the body's and the service's).
    pub request: Request,
}

/// Why a request is refused: an HTTP status, a message and JSON details (the filter's caret).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// One line saying what is wrong.
    pub message: String,
    /// More, as JSON (`null` when nothing).
    pub detail: Value,
}

fn refuse(message: impl Into<String>, detail: Value) -> Refusal {
    Refusal { status: 400, message: message.into(), detail }
}

fn time_value(v: &Value, what: &str) -> Result<u64, Refusal> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return Err(refuse(format!("{what} must be an RFC 3339 time or epoch seconds"), Value::Null)),
    };
    pcaptool_packet::parse_time(&text).map_err(|e| refuse(format!("{what}: {e}"), Value::Null))
}

/// Decodes a query body (empty or blank: every packet of the only source) under the service's `limits`.
pub fn parse_query(bytes: &[u8], limits: &Limits) -> Result<Query, Refusal> {
    if bytes.len() > limits.body_bytes {
        return Err(Refusal {
            status: 413,
            message: format!("the request body is larger than {} bytes", limits.body_bytes),
            detail: Value::Null,
        });
    }
    let body: QueryBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        QueryBody::default()
    } else {
        serde_json::from_slice(bytes)
            .map_err(|e| refuse(format!("the request body is not a query: {e}"), json!({ "see": "docs/service.md" })))?
    };
    checked(body, limits)
}

/// The query string of `GET /v1/flows`: `filter`, `after`, `before`, `source` (URL-encoded).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowsParams {
    filter: Option<String>,
    after: Option<String>,
    before: Option<String>,
    source: Option<String>,
}

/// Decodes the query string of `GET /v1/flows` (without its `?`).
pub fn parse_flows_query(query: &str, limits: &Limits) -> Result<Query, Refusal> {
    if query.len() > limits.body_bytes {
        return Err(Refusal {
            status: 414,
            message: format!("the query string is longer than {} bytes", limits.body_bytes),
            detail: Value::Null,
        });
    }
    let p: FlowsParams = serde_urlencoded::from_str(query)
        .map_err(|e| refuse(format!("the query string is not filter, after, before and source: {e}"), Value::Null))?;
    let body = QueryBody {
        filter: p.filter.unwrap_or_default(),
        after: p.after.map(Value::String),
        before: p.before.map(Value::String),
        source: p.source,
        ..QueryBody::default()
    };
    checked(body, limits)
}

/// A body's fields checked and turned into an engine request.
fn checked(body: QueryBody, limits: &Limits) -> Result<Query, Refusal> {
    let mut request = match pcaptool_query::Filter::new(&body.filter) {
        Ok(f) => Request::new().with_filter(f),
        Err(e) => {
            return Err(refuse(
                format!("invalid filter: {}", e.message()),
                json!({ "caret": e.caret(), "span": { "start": e.span.start, "end": e.span.end } }),
            ));
        }
    };
    request.after = body.after.as_ref().map(|v| time_value(v, "after")).transpose()?;
    request.before = body.before.as_ref().map(|v| time_value(v, "before")).transpose()?;
    request.flow = body.flow;
    request.limit = match (body.limit, limits.packets) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if let Some(f) = &body.format
        && f != "pcap"
        && f != "pcapng"
    {
        return Err(refuse(format!("format must be pcap or pcapng, not {f:?}"), Value::Null));
    }
    Ok(Query { body, request })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_decode_into_requests() {
        let l = Limits { packets: Some(100), ..Limits::default() };
        let q = parse_query(
            br#"{"filter": "tcp", "after": 1700000000, "before": "2023-11-14T22:13:21Z", "limit": 500}"#,
            &l,
        )
        .unwrap();
        assert_eq!(q.request.after, Some(1_700_000_000_000_000_000));
        assert_eq!(q.request.before, Some(1_700_000_001_000_000_000));
        assert_eq!(q.request.limit, Some(100), "the service's limit is the lower");
        assert!(parse_query(b"", &l).unwrap().request.filter.is_some());
        let r = parse_query(br#"{"filter": "tcp and"}"#, &l).unwrap_err();
        assert_eq!(r.status, 400);
        assert!(r.detail["caret"].as_str().unwrap().contains('^'));
        assert_eq!(parse_query(br#"{"format": "csv"}"#, &l).unwrap_err().status, 400);
        assert_eq!(parse_query(br#"{"after": [1]}"#, &l).unwrap_err().status, 400);
        assert_eq!(parse_query(br#"{"filter": 3}"#, &l).unwrap_err().status, 400);
        assert_eq!(parse_query(&[b' '; 70_000], &l).unwrap_err().status, 413);
    }

    #[test]
    fn flow_query_strings_decode() {
        let l = Limits::default();
        let q = parse_flows_query("filter=tcp%20port%20443&after=2024-01-01T00%3A00%3A00Z&source=st", &l).unwrap();
        assert_eq!(q.body.filter, "tcp port 443");
        assert_eq!(q.body.source.as_deref(), Some("st"));
        assert_eq!(q.request.after, Some(1_704_067_200_000_000_000));
        assert!(parse_flows_query("", &l).is_ok());
        assert_eq!(parse_flows_query("filter=tcp+and", &l).unwrap_err().status, 400);
        assert_eq!(parse_flows_query("path=/etc/passwd", &l).unwrap_err().status, 400);
        assert_eq!(parse_flows_query(&"a".repeat(70_000), &l).unwrap_err().status, 414);
    }
}
