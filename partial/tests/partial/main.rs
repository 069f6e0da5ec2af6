//! The acceptance tests of partial states, in one test binary: merges against
//! one-pass states and a plain model, the merge laws, the byte form, and the
//! errors. Property tests are proptest's: a failure prints the shrunk input
//! and saves its seed under `proptest-regressions/`, from where it is replayed
//! first on the next run.

#![allow(clippy::unwrap_used)]

mod answers;
mod codec;
mod errors;
mod groups;
mod merge;
mod support;
