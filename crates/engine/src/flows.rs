//! A store's flows as records (Zeek's conn.log names), as `pcaptool flows --json` and the service's
//! `GET /v1/flows` give them.

use pcaptool_flowstore::Flow;
use serde::{Deserialize, Serialize};

/// One flow of a flow store, with Zeek's conn.log field names; times as `SECONDS.NANOSECONDS`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FlowRecord {
    /// The flow's id in its store (`Request::flow`).
    pub id: u64,
    /// First packet's time.
    pub ts: String,
    /// Last packet's time minus the first's.
    pub duration: String,
    /// Originator (the side of the first packet): address and port.
    pub orig_h: String,
    /// See `orig_h`.
    pub orig_p: u16,
    /// Responder: address and port.
    pub resp_h: String,
    /// See `resp_h`.
    pub resp_p: u16,
    /// IP protocol number.
    pub proto: u8,
    /// VLAN id (0: none).
    pub vlan: u16,
    /// Zeek's connection state.
    pub conn_state: String,
    /// Originator's packets, wire bytes and transport payload bytes.
    pub orig_pkts: u64,
    /// See `orig_pkts`.
    pub orig_bytes: u64,
    /// See `orig_pkts`.
    pub orig_payload: u64,
    /// OR of the originator's TCP flags.
    pub orig_flags: u8,
    /// Responder's packets, wire bytes and payload bytes.
    pub resp_pkts: u64,
    /// See `resp_pkts`.
    pub resp_bytes: u64,
    /// See `resp_pkts`.
    pub resp_payload: u64,
    /// OR of the responder's TCP flags.
    pub resp_flags: u8,
    /// The store the flow is from, among the parts of a merged source (ids are per store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

fn seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl From<&Flow> for FlowRecord {
    fn from(f: &Flow) -> FlowRecord {
        let (oh, op) = f.orig_endpoint();
        let (rh, rp) = f.resp_endpoint();
        FlowRecord {
            id: f.id,
            ts: seconds(f.first_ns),
            duration: seconds(f.last_ns.saturating_sub(f.first_ns)),
            orig_h: oh.to_string(),
            orig_p: op,
            resp_h: rh.to_string(),
            resp_p: rp,
            proto: f.key.proto.0,
            vlan: f.key.vlan,
            conn_state: f.state.name().to_string(),
            orig_pkts: f.orig.packets,
            orig_bytes: f.orig.bytes,
            orig_payload: f.orig.payload,
            orig_flags: f.orig.flags,
            resp_pkts: f.resp.packets,
            resp_bytes: f.resp.bytes,
            resp_payload: f.resp.payload,
            resp_flags: f.resp.flags,
            source: None,
        }
    }
}
