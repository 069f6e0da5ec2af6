//! Shared parts of Sealion's benchmarks (the binaries are `storage-bench`
//! and `read-bench`).

pub mod tsbs;

/// The allocator the `sealion` binary runs with, so each benchmark measures
/// Sealion's code (and the peers in the same process) as it is shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
