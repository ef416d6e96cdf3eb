//! tcpdump's filter language for pcaptool: parser, evaluator and planner.
//!
//! Filled by the filter-language issue; until then it is empty.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
