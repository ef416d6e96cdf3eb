//! Live capture for pcaptool: AF_XDP with an AF_PACKET fallback.
//!
//! Filled by the live-capture issue; until then it is empty.

#![deny(missing_docs)]
