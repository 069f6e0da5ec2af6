//! Shared parts of Sealion's benchmarks (the binaries are `storage-bench`
//! and `read-bench`).

pub mod tsbs;
