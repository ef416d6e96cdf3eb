//! Shared helpers of the integration tests live in the test files; this library is empty.
