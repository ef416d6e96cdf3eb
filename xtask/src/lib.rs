//! Library half of xtask: the deterministic trace generator, shared with the integration tests and benchmarks.

#![forbid(unsafe_code)]

pub mod faults;
pub mod tracegen;

pub mod netns;
