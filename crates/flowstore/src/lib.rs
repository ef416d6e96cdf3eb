//! Flow-clustered packet storage with two-stage indexes (FloSIS).
//!
//! Filled by the flow-store issue; until then it is empty.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
